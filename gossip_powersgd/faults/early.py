"""Imported first of all by `gossip_powersgd/__init__.py`, before torch: runs `faults.on_import`
(the training programs' rank supervisor under mpiexec, and their liveness monitor)."""

from . import on_import

on_import()
