"""Tests for gossip_powersgd.compressors: wire formats, sizes, determinism and the operators' laws."""

import math

import pytest
import torch

from gossip_powersgd.compressors import (
    QSGD,
    Compressor,
    Identity,
    LowRank,
    RandomK,
    SignNorm,
    TopK,
    _pack_bits,
    _unpack_bits,
    encoded_size,
    parse_compressor,
)

DTYPES = [torch.float32, torch.float64]

# One instance of every compressor, lossy ones with parameters that actually compress.
ALL = [
    Identity(),
    TopK(0.1),
    RandomK(0.1),
    RandomK(0.25, seed=7, scaled=True),
    SignNorm(),
    QSGD(1),
    QSGD(16),
    QSGD(255),
    LowRank(1),
    LowRank(2, iterations=3),
]
IDS = [repr(c) for c in ALL]

# Shapes covering 1-D, sizes not divisible by 8, matrices, conv weights and a scalar.
SHAPES = [(1,), (13,), (64,), (9, 11), (16, 3, 3, 3), ()]


def randn(*shape, dtype=torch.float64, seed=0):
    return torch.randn(tuple(shape), generator=torch.Generator().manual_seed(seed), dtype=dtype)


def encode(c: Compressor, x, key=0, fill=0):
    out = torch.full((c.nbytes(x.shape, x.dtype),), fill, dtype=torch.uint8)
    c.encode(x, out, key)
    return out


def decode(c: Compressor, payload, like, key=0):
    out = torch.empty_like(like)
    c.decode(payload, out, key)
    return out


def as_bytes_int(payload: torch.Tensor) -> int:
    return int.from_bytes(bytes(payload.tolist()), "little")


def expected_nbytes(c: Compressor, shape, dtype) -> int:
    """The wire-format formulas, restated independently of the implementation."""
    d = math.prod(shape)
    item = torch.empty((), dtype=dtype).element_size()
    k = max(1, round(getattr(c, "ratio", 1) * d))
    if isinstance(c, Identity):
        return d * item
    if isinstance(c, TopK):
        return k * (item + 4)
    if isinstance(c, RandomK):
        return k * item
    if isinstance(c, SignNorm):
        return item + math.ceil(d / 8)
    if isinstance(c, QSGD):
        b = math.ceil(math.log2(c.levels + 1)) + 1
        return item + math.ceil(d * b / 8)
    if isinstance(c, LowRank):
        if len(shape) < 2:
            return d * item
        rows, cols = shape[0], d // shape[0]
        r = min(c.rank, rows, cols)
        return min(r * (rows + cols), d) * item
    raise AssertionError(c)


# ------------------------------------------------------------------------------------------------
# sizes, buffers, determinism (every compressor)


@pytest.mark.parametrize("c", ALL, ids=IDS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_nbytes_matches_formula_and_round_trip_shape(c, dtype):
    for i, shape in enumerate(SHAPES):
        x = randn(*shape, dtype=dtype, seed=i)
        n = c.nbytes(x.shape, dtype)
        assert n == expected_nbytes(c, shape, dtype), shape
        assert encoded_size(c, [x]) == n
        y = c.compress(x, key=3)
        assert y.shape == x.shape and y.dtype == dtype
        assert torch.isfinite(y).all()


@pytest.mark.parametrize("c", ALL, ids=IDS)
def test_encode_writes_exactly_nbytes_at_any_offset(c):
    x = randn(9, 11)
    n = c.nbytes(x.shape, x.dtype)
    reference = encode(c, x, key=5)
    # Whatever was in the buffer before (every byte written, padding bits zeroed) and wherever the
    # payload sits inside a larger message (odd offsets break naive dtype views), bytes are equal
    # and the guard bytes around it are untouched.
    for fill in (0x00, 0xFF):
        for offset in (0, 1, 3):
            message = torch.full((n + offset + 5,), 0xA5, dtype=torch.uint8)
            message[offset : offset + n] = fill
            c.encode(x, message[offset : offset + n], 5)
            assert torch.equal(message[offset : offset + n], reference)
            assert (message[:offset] == 0xA5).all() and (message[offset + n :] == 0xA5).all()
            assert torch.equal(decode(c, message[offset : offset + n], x, key=5), c.compress(x, 5))


@pytest.mark.parametrize("c", ALL, ids=IDS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_deterministic_same_key_same_bits(c, dtype):
    x = randn(16, 3, 3, 3, dtype=dtype, seed=1)
    a, b = encode(c, x, key=11), encode(c, x.clone(), key=11)
    assert torch.equal(a, b)
    assert torch.equal(decode(c, a, x, key=11), decode(c, b, x, key=11))
    assert torch.equal(c.compress(x, 11), c.compress(x, 11))
    # What the sender computes for itself is exactly what a receiver decodes from the bytes.
    received = a.clone()
    assert torch.equal(decode(c, received, x, key=11), c.compress(x, 11))


@pytest.mark.parametrize("c", [RandomK(0.1), QSGD(4), LowRank(1)], ids=repr)
def test_randomized_compressors_depend_on_key(c):
    x = randn(20, 30)
    assert not torch.equal(encode(c, x, key=1), encode(c, x, key=2))


@pytest.mark.parametrize("c", ALL, ids=IDS)
def test_non_contiguous_input_and_output(c):
    x = randn(11, 9).T  # a transposed view
    expected = c.compress(x.contiguous(), 4)
    assert torch.equal(c.compress(x, 4), expected)
    out = torch.empty(11, 9, dtype=x.dtype).T  # a non-contiguous (9, 11) destination
    c.decode(encode(c, x, key=4), out, 4)
    assert torch.equal(out, expected)


@pytest.mark.parametrize("c", ALL, ids=IDS)
def test_wrong_buffer_size_is_rejected(c):
    x = randn(9, 11)
    n = c.nbytes(x.shape, x.dtype)
    with pytest.raises(ValueError, match="bytes"):
        c.encode(x, torch.empty(n + 1, dtype=torch.uint8), 0)
    with pytest.raises(ValueError, match="bytes"):
        c.decode(torch.empty(n, dtype=torch.float32), torch.empty_like(x), 0)


# ------------------------------------------------------------------------------------------------
# identity


@pytest.mark.parametrize("dtype", DTYPES + [torch.float16, torch.int64])
def test_identity_round_trip_exact(dtype):
    c = Identity()
    x = (randn(7, 5, seed=2) * 100).to(dtype)
    payload = encode(c, x)
    assert torch.equal(payload, x.reshape(-1).view(torch.uint8))
    assert torch.equal(decode(c, payload, x), x)


# ------------------------------------------------------------------------------------------------
# top-k


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("ratio", [0.01, 0.1, 0.5, 1.0])
def test_topk_keeps_exactly_the_k_largest(dtype, ratio):
    x = randn(10, 17, dtype=dtype, seed=3)
    c = TopK(ratio)
    k = max(1, round(ratio * x.numel()))
    y = c.compress(x)
    kept = y != 0
    assert kept.sum() == k
    assert torch.equal(y[kept], x[kept])
    # Every kept magnitude is at least every dropped one.
    if k < x.numel():
        assert x.abs()[kept].min() >= x.abs()[~kept].max()
    # Payload: values then int32 indices, ascending.
    payload = encode(c, x)
    item = x.element_size()
    indices = payload[k * item :].clone().view(torch.int32).long()
    assert torch.equal(indices, kept.reshape(-1).nonzero().reshape(-1))
    assert torch.equal(payload[: k * item].clone().view(dtype), x.reshape(-1)[indices])


# ------------------------------------------------------------------------------------------------
# random-k


def test_randomk_same_key_same_indices_other_key_other_indices():
    x = torch.arange(1, 201, dtype=torch.float64)  # distinct values reveal where each one lands
    c = RandomK(0.05)
    payload = encode(c, x, key=42)
    same = decode(c, payload, x, key=42)
    support = same != 0
    assert support.sum() == 10
    assert torch.equal(same[support], x[support])  # decoded at the very indices it was encoded from
    other = decode(c, payload, x, key=43)
    assert not torch.equal(other[other != 0], x[other != 0])
    assert not torch.equal(c.indices(200, 42), c.indices(200, 43))
    assert not torch.equal(c.indices(200, 42), RandomK(0.05, seed=1).indices(200, 42))
    assert c.indices(200, 42).unique().numel() == 10  # without replacement


def test_randomk_scaled_is_unbiased():
    d, copies, keys, ratio = 20, 20, 300, 0.25
    x = randn(d, seed=4)
    c = RandomK(ratio, scaled=True)
    # Averaging over keys and over identical copies inside one tensor: 6,000 samples per entry for
    # 300 calls (the calls, not the arithmetic, are what costs time).
    mean = (
        sum(c.compress(x.repeat(copies), key) for key in range(keys)).view(copies, d).mean(0) / keys
    )
    # C(x)_i = (d/k) x_i with probability k/d, else 0: Var = x_i² (d/k − 1); sampling without
    # replacement correlates the copies negatively, so this bound on the mean's spread is safe.
    k_over_d = round(ratio * d * copies) / (d * copies)
    std_of_mean = x.abs() * math.sqrt((1 / k_over_d - 1) / (copies * keys))
    assert ((mean - x).abs() <= 5 * std_of_mean + 1e-12).all()
    # Unscaled, it is the plain (biased) selection.
    assert torch.equal(RandomK(ratio).compress(x, 3) * 4, c.compress(x, 3))


# ------------------------------------------------------------------------------------------------
# sign + norm


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", [1, 7, 8, 9, 13, 100])
def test_sign_norm_layout_and_l1(dtype, d):
    x = randn(d, dtype=dtype, seed=d)
    x[0] = 0.0  # sign(0) is +
    c = SignNorm()
    payload = encode(c, x)
    item = x.element_size()
    assert payload.numel() == item + math.ceil(d / 8)
    scale = payload[:item].clone().view(dtype)[0]
    assert scale == x.abs().sum() / d
    bits = sum(1 << i for i in range(d) if x[i] < 0)
    assert as_bytes_int(payload[item:]) == bits  # LSB-first, padding bits zero
    y = decode(c, payload, x)
    assert torch.equal(y, torch.where(x < 0, -scale, scale))
    assert torch.allclose(
        y.abs().sum(), x.abs().sum(), rtol=1e-6 if dtype == torch.float32 else 1e-14
    )


# ------------------------------------------------------------------------------------------------
# QSGD


@pytest.mark.parametrize("levels", [1, 2, 3, 15, 16, 255])
@pytest.mark.parametrize("dtype", DTYPES)
def test_qsgd_level_packing(levels, dtype):
    d = 37  # d·b is not a multiple of 8 for any of these b
    x = randn(d, dtype=dtype, seed=levels)
    x[5] = 0.0
    c = QSGD(levels)
    b = math.ceil(math.log2(levels + 1)) + 1
    payload = encode(c, x, key=9)
    item = x.element_size()
    assert payload.numel() == item + math.ceil(d * b / 8)
    norm = payload[:item].clone().view(dtype)[0]
    assert torch.allclose(norm, torch.linalg.vector_norm(x))
    y = decode(c, payload, x, key=9)
    level = torch.round(y.abs() * levels / norm).long()
    scaled = x.abs() * levels / norm
    # ξ is one of the two integers around s|x|/‖x‖ and the sign survives.
    assert ((level == scaled.floor()) | (level == scaled.ceil())).all()
    assert (level <= levels).all() and y[5] == 0
    assert (torch.sign(y) * torch.sign(x) >= 0).all()
    assert torch.allclose(y, torch.sign(x) * level * norm / levels)
    # Bit layout: code = level | sign << (b−1), entry i at bits i·b.. of a little-endian stream.
    codes = [int(level[i]) | (int(x[i] < 0) << (b - 1)) for i in range(d)]
    assert as_bytes_int(payload[item:]) == sum(code << (i * b) for i, code in enumerate(codes))


@pytest.mark.parametrize("levels", [1, 4])
def test_qsgd_is_unbiased(levels):
    d, copies, keys = 16, 20, 300
    x = randn(d, seed=6)
    c = QSGD(levels)
    xs = x.repeat(copies)
    mean = sum(c.compress(xs, key) for key in range(keys)).view(copies, d).mean(0) / keys
    norm = torch.linalg.vector_norm(xs)
    p = x.abs() * levels / norm
    p = p - p.floor()
    # ξ is floor(·) + Bernoulli(p), independently per entry: Var(C_i) = (‖x‖/s)² p(1−p).
    std_of_mean = norm / levels * torch.sqrt(p * (1 - p) / (copies * keys))
    assert ((mean - x).abs() <= 5 * std_of_mean + 1e-12).all()


def test_qsgd_zero_vector():
    x = torch.zeros(10, dtype=torch.float64)
    assert torch.equal(QSGD(4).compress(x), x)


@pytest.mark.parametrize("width", [1, 2, 3, 5, 8, 9, 13, 32])
@pytest.mark.parametrize("n", [0, 1, 7, 8, 29])
def test_bit_packing_round_trip(width, n):
    codes = torch.randint(0, 2**width, (n,), generator=torch.Generator().manual_seed(width + n))
    packed = _pack_bits(codes, width)
    assert packed.dtype == torch.uint8 and packed.numel() == math.ceil(n * width / 8)
    assert as_bytes_int(packed) == sum(int(v) << (i * width) for i, v in enumerate(codes))
    assert torch.equal(_unpack_bits(packed, n, width), codes)


# ------------------------------------------------------------------------------------------------
# low rank


@pytest.mark.parametrize("r", [1, 2, 3])
@pytest.mark.parametrize("shape", [(30, 40), (16, 8, 3, 3)])
def test_lowrank_exact_on_rank_r(r, shape):
    rows, cols = shape[0], math.prod(shape[1:])
    m = (randn(rows, r, seed=r) @ randn(cols, r, seed=10 + r).T).reshape(shape)
    c = LowRank(r)
    assert c.nbytes(shape, torch.float64) == r * (rows + cols) * 8
    for key in range(3):
        assert torch.allclose(c.compress(m, key), m, atol=1e-10 * m.abs().max())
    # Higher rank than needed is still exact.
    assert torch.allclose(LowRank(r + 2).compress(m, 0), m, atol=1e-10 * m.abs().max())


def test_lowrank_zero_matrix_gives_zeros():
    for dtype in DTYPES:
        x = torch.zeros(20, 30, dtype=dtype)
        for c in (LowRank(1), LowRank(3, iterations=2)):
            y = c.compress(x, 0)
            assert not torch.isnan(y).any()
            assert torch.equal(y, x)


def test_lowrank_sends_exactly_what_does_not_pay_to_factor():
    c = LowRank(2)
    for shape in [
        (50,),
        (),
        (0, 4),
        (3, 3),
        (2, 100),
    ]:  # last: rank 2 of a 2-row matrix is all of it
        x = randn(*shape, seed=8)
        assert c.nbytes(x.shape, x.dtype) == x.numel() * 8
        assert torch.equal(c.compress(x), x)


def test_lowrank_more_iterations_approach_best_rank_r():
    u, _ = torch.linalg.qr(randn(40, 40, seed=1))
    v, _ = torch.linalg.qr(randn(60, 40, seed=2))
    m = u @ torch.diag(0.7 ** torch.arange(40.0, dtype=torch.float64)) @ v.T
    best = torch.linalg.svdvals(m)[2:].norm()  # Eckart–Young: the optimal rank-2 error
    errors = [torch.linalg.norm(LowRank(2, iterations=i).compress(m, 0) - m) for i in (1, 3, 10)]
    assert errors[0] >= errors[1] >= errors[2]
    assert errors[2] <= best * 1.001


def test_lowrank_float32():
    m = (randn(30, 2, seed=1) @ randn(50, 2, seed=2).T).float()
    assert torch.allclose(LowRank(2).compress(m, 0), m, atol=1e-4)


# ------------------------------------------------------------------------------------------------
# arguments and the CLI spelling


@pytest.mark.parametrize(
    "make, name",
    [
        (lambda: TopK(0), "ratio"),
        (lambda: TopK(1.5), "ratio"),
        (lambda: TopK(-0.1), "ratio"),
        (lambda: TopK(float("nan")), "ratio"),
        (lambda: RandomK(0), "ratio"),
        (lambda: RandomK(2), "ratio"),
        (lambda: RandomK(0.1, seed=1.5), "seed"),
        (lambda: QSGD(0), "levels"),
        (lambda: QSGD(-3), "levels"),
        (lambda: QSGD(2.5), "levels"),
        (lambda: LowRank(0), "rank"),
        (lambda: LowRank(1, iterations=0), "iterations"),
    ],
)
def test_bad_arguments_raise_value_error_naming_them(make, name):
    with pytest.raises(ValueError, match=name):
        make()


def test_valid_range_is_in_the_message():
    with pytest.raises(ValueError, match=r"\(0, 1\]"):
        TopK(0)
    with pytest.raises(ValueError, match=">= 1"):
        LowRank(0)


@pytest.mark.parametrize(
    "spec",
    [
        "identity",
        "topk:0.01",
        "topk:1.0",
        "randomk:0.01",
        "randomk:0.5,seed=3,scaled=true",
        "sign",
        "qsgd:16",
        "lowrank:1",
        "lowrank:4,iterations=2",
    ],
)
def test_parse_round_trips(spec):
    c = parse_compressor(spec)
    assert repr(c) == spec
    assert parse_compressor(repr(c)) == c


def test_parse_builds_the_right_objects():
    assert parse_compressor("topk:0.01") == TopK(0.01)
    assert parse_compressor(" QSGD : 16 ") == QSGD(16)
    assert parse_compressor("randomk:ratio=0.2,scaled=1") == RandomK(0.2, scaled=True)
    assert parse_compressor("lowrank:rank=2,iterations=3") == LowRank(2, iterations=3)
    assert repr(RandomK(0.2, seed=5)) == "randomk:0.2,seed=5"
    assert isinstance(parse_compressor("sign"), SignNorm)
    c = TopK(0.1)
    assert parse_compressor(c) is c


@pytest.mark.parametrize(
    "spec, message",
    [
        ("foo", "unknown name 'foo'; valid: identity, topk, randomk, sign, qsgd, lowrank"),
        ("topk", "needs ratio"),
        ("topk:abc", "ratio"),
        ("topk:2", "ratio"),
        ("qsgd:1.5", "levels"),
        ("lowrank:1,bogus=2", "bogus"),
        ("identity:3", "cannot parse"),
        ("lowrank:1,2", "cannot parse"),
        ("randomk:0.1,scaled=maybe", "scaled"),
        ("lowrank:1,rank=2", "twice"),
    ],
)
def test_parse_rejects_bad_specs(spec, message):
    with pytest.raises(ValueError, match=message):
        parse_compressor(spec)


def test_encoded_size_sums_tensors():
    tensors = [randn(10, 20), randn(20), randn(4, 3, 3, 3)]
    for c in ALL:
        assert encoded_size(c, tensors) == sum(c.nbytes(t.shape, t.dtype) for t in tensors)
    assert encoded_size(TopK(0.1), tensors) == (20 + 2 + 11) * 12


def test_lossy_compressors_reject_integer_tensors():
    for c in ALL[1:]:
        with pytest.raises(TypeError, match="floating"):
            c.nbytes(torch.Size([4]), torch.int64)


# ---- variance bounds and the contraction scale ------------------------------------------------------
def test_variance_bounds_say_which_compressors_are_unbiased():
    assert QSGD(2).variance_bound(10_000) == 50.0  # min(10000 / 4, 100 / 2)
    assert QSGD(2).variance_bound(100) == 5.0  # min(25, 5)
    assert QSGD(16).variance_bound(64) == 0.25  # min(64 / 256, 8 / 16)
    assert RandomK(0.25, scaled=True).variance_bound(100) == 3.0  # numel / k - 1
    assert Identity().variance_bound(7) == 0.0
    for contractive in (TopK(0.1), RandomK(0.25), SignNorm(), LowRank(2)):
        assert contractive.variance_bound(100) is None
        assert contractive.contraction_scale(100) == 1.0
    assert QSGD(2).contraction_scale(100) == 6.0


@pytest.mark.parametrize("levels", [1, 2, 4])
def test_qsgd_second_moment_is_within_its_bound(levels):
    """E‖C(x)‖² <= (1 + ω)‖x‖² (Alistarh et al., Lemma 3.1), estimated over 400 keys."""
    x = randn(50, seed=11)
    second = torch.stack(
        [QSGD(levels).compress(x, key).square().sum() for key in range(400)]
    ).mean()
    assert second <= (1 + QSGD(levels).variance_bound(50)) * x.square().sum()
    assert second > 1.5 * x.square().sum()  # and far from contractive: the rescaling is needed


def test_rescaled_scaled_randomk_is_the_plain_selection():
    x = randn(40, seed=12)
    scaled, plain = RandomK(0.25, seed=3, scaled=True), RandomK(0.25, seed=3)
    torch.testing.assert_close(
        scaled.compress(x, 9) / scaled.contraction_scale(40), plain.compress(x, 9)
    )
