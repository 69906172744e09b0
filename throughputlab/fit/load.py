"""Use the stored fit, else fit now: the one place that decides, and with which bootstrap, for
every command that reads a profile's model (``report``, ``decide``, ``predict --profile``).

A fit made here is the one ``throughputlab fit`` would store: its bootstrap is the stored fit's
when the profile holds one that can no longer be used (out of date after a ``bench --resume``,
or written by another version), else ``throughputlab fit``'s default, so a profile shows the
same intervals in every command. Importing this module imports no scipy; making a fit does.
"""

from __future__ import annotations

from typing import Optional

from throughputlab.fit.schema import DEFAULT_BOOTSTRAP, DEFAULT_SEED, FitResult, load_fit
from throughputlab.records.profile import Profile
from throughputlab.throughput import ThroughputModel


def refit_bootstrap(profile: Profile) -> int:
    """The bootstrap of a fit made now: the stored fit's, else ``throughputlab fit``'s default."""
    stored = profile.fit.get("bootstrap_samples") if isinstance(profile.fit, dict) else None
    return stored if type(stored) is int and stored >= 0 else DEFAULT_BOOTSTRAP


def load_or_fit(profile: Profile, *, said: Optional[list[str]] = None) -> FitResult:
    """The profile's stored fit (or prediction), else a fit made now (:func:`refit_bootstrap`,
    ``DEFAULT_SEED``); ``said`` gets a sentence saying so when the fit is made now. Raises
    UserError where nothing can be fitted (a prediction without its fit, no successful point)."""
    stored = load_fit(profile)
    if stored is not None:
        return stored
    from throughputlab.fit.run import fit_profile  # scipy: imported only when a fit is made

    bootstrap = refit_bootstrap(profile)
    fit = fit_profile(profile, bootstrap=bootstrap, seed=DEFAULT_SEED)
    if said is not None:
        if profile.fit:
            said.append(f"the profile's stored fit is out of date; fitted again now (bootstrap {bootstrap}, as the "
                        f"stored fit, seed {DEFAULT_SEED}); store it with `throughputlab fit PROFILE`")
        else:
            said.append(f"the profile has no stored fit; fitted now with `throughputlab fit`'s defaults (bootstrap "
                        f"{bootstrap}, seed {DEFAULT_SEED}); store one with `throughputlab fit PROFILE`")
    return fit


def load_model(profile: Profile) -> ThroughputModel:
    """The throughput model of :func:`load_or_fit`."""
    return load_or_fit(profile).model
