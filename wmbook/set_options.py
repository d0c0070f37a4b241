"""The checks `wmbook regenerate` makes of its options before any run: `--expect` values, the device a set must run
on (`--device-name`, a `--publish` folder of one device), and a resumed set's plan against the runs asked for."""

from __future__ import annotations

import math

from .published_set import Job, run_params


def expectations(ap, given: list[str]) -> dict[str, float]:
    """--expect RUN=MINUTES values -> {run: minutes}; a malformed one is refused naming the option."""
    out = {}
    for g in given:
        name, sep, value = g.partition("=")
        try:
            minutes = float(value)
        except ValueError:
            minutes = math.nan
        if not sep or not name.strip() or not (minutes > 0 and math.isfinite(minutes)):
            ap.error(f"--expect={g!r} is not allowed; allowed values: RUN=MINUTES with a run of the set "
                     "(e.g. 06_cuda_graphs-wma=18) and minutes > 0")
        out[name.strip()] = minutes
    return out


def check_expected(ap, expect: dict[str, float], jobs: list[Job]) -> None:
    """--expect names runs of the set only (a typo would otherwise change nothing, silently)."""
    names = [j.name for j in jobs]
    unknown = sorted(set(expect) - set(names))
    if unknown:
        ap.error(f"--expect names {unknown}, not runs of this set; allowed values: {names}")


def wanted_devices(a) -> list[tuple[str, str]]:
    """The devices the set must run on, each with the option that asks for it: `--device-name`, and the device of a
    `--publish` folder of one device (data/reports/h200 holds H200 runs only); both where both are given."""
    wanted = [(a.device_name, f"--device-name={a.device_name!r}")] if a.device_name is not None else []
    if a.publish is not None:
        from .published import folder_device  # noqa: PLC0415  heavy: pandas, nbformat

        want = folder_device(a.publish)
        if want:
            wanted.append((want, f"--publish {a.publish} (it holds the {want}'s runs only)"))
    return wanted


def check_device(ap, wanted: list[tuple[str, str]], device: str, whose: str, allowed: str = "a host") -> None:
    """Refuse, before any run or move, a set whose runs would not be of the wanted devices (a host may give another
    card than the one asked for: its runs cannot be published where the reference device's go). `whose` says whose
    device `device` is ('this host has', 'the set ran on'), `allowed` what may have it instead."""
    from .published import device_matches  # noqa: PLC0415  heavy: pandas, nbformat

    for want, why in wanted:
        if not device_matches(device, want):
            ap.error(f"{why}: {whose} {device}; allowed: {allowed} whose device name has the word {want!r} (or leave "
                     "the option out for a set of this device)")


def check_same_plan(ap, given: list[Job], held: list[Job], out) -> None:
    """A set's plan is fixed when it starts: `--notebooks`, `--workloads` and `-p` on a folder that holds a set must
    plan the runs it holds (the command that started it, run again to resume it), or they would be passed over in
    silence while the set runs its own plan."""
    mine, theirs = run_params(given), run_params(held)
    if mine == theirs:
        return
    extra, lacking = sorted(set(mine) - set(theirs)), sorted(set(theirs) - set(mine))
    other = sorted(n for n in set(mine) & set(theirs) if mine[n] != theirs[n])
    said = "; ".join(s for s in (f"runs not in the set: {extra}" if extra else "",
                                 f"the set's runs left out: {lacking}" if lacking else "",
                                 f"other parameters for: {other}" if other else "") if s)
    ap.error(f"--notebooks/--workloads/-p: {out} holds a set whose plan these options do not give ({said}); allowed: "
             "the options that started it, or none (a set resumes its own plan); another --out, or --fresh to start "
             "this one over, for other runs")
