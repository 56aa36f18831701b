"""What a valid policy can still get wrong: a ``fleetops policy check`` of its rules.

A policy that loads can hold rules that never match: a ``data`` key no finding of the check holds
(the keys are the declaration :data:`fleetops.schemas.FINDING_DATA_KEYS`, what the detectors set),
or a match entry an earlier rule always takes first (same check, its severities among the earlier
entry's, and every condition of the earlier entry among its own: the earlier entry is no narrower).
:func:`policy_problems` lists them, one ``(field, problem)`` each; :func:`check_policy_file` is the
check of one file (unknown checks, severities and every other schema problem come from loading it).
"""

from __future__ import annotations

from fleetops.documents import DocumentError, field_path
from fleetops.policy.language import Match, Policy, load_policy
from fleetops.schemas import FINDING_DATA_KEYS

ANY = "*"  # a path part that is any key (documented with the package)


def _covers(earlier: Match, later: Match) -> bool:
    """True when every finding ``later`` takes is one ``earlier`` takes."""
    return (
        earlier.check == later.check
        and set(later.severity) <= set(earlier.severity)
        and all(path in later.data and later.data[path] == ops for path, ops in earlier.data.items())
    )


def policy_problems(policy: Policy) -> list[tuple[str, str]]:
    """Each rule's match entries that can never match, as ``(field, problem)``, in the file's order."""
    out: list[tuple[str, str]] = []
    for i, rule in enumerate(policy.rules):
        for j, match in enumerate(rule.match):
            declared = FINDING_DATA_KEYS[match.check]
            for path in match.data:
                key = path.split(".")[0]
                if key != ANY and key not in declared:
                    out.append(
                        (
                            field_path(("rules", i, "match", j, "data", path)),
                            f"rule {rule.name}: no {match.check} finding has the data key {key!r}, so this "
                            f"never matches (its keys: {', '.join(sorted(declared))})",
                        )
                    )
            first = next(
                (
                    (k, earlier)
                    for k, earlier in enumerate(policy.rules[:i])
                    if any(_covers(m, match) for m in earlier.match)
                ),
                None,
            )
            if first is not None:
                k, earlier = first
                out.append(
                    (
                        field_path(("rules", i, "match", j)),
                        f"rule {rule.name}: shadowed by rule {earlier.name} (rules[{k}]), which is earlier "
                        f"and takes every {match.check} finding this entry would (same check, no narrower "
                        "match): it never matches",
                    )
                )
    return out


def check_policy_file(path: str) -> tuple[Policy | None, list[str]]:
    """The policy at ``path`` and one line per problem (``"FILE: FIELD: problem"``); no policy when it
    does not load."""
    try:
        policy = load_policy(path)
    except DocumentError as exc:
        return None, [str(exc)]
    return policy, [str(DocumentError(path, problem, field)) for field, problem in policy_problems(policy)]
