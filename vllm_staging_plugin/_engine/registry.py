"""Every runtime fix, in start order: a new fix is one module beside these and one entry here.

Each fix's module docstring is its registry entry (why, how, upstream PR, removal); the installer starts
every fix listed here that the settings enable.
"""

from __future__ import annotations

from .fix import RuntimeFix
from .kda_fix import KdaFix
from .runner_guard import V1RunnerGuard
from .staging_fix import StagingFix

FIXES: tuple[type[RuntimeFix], ...] = (StagingFix, V1RunnerGuard, KdaFix)
