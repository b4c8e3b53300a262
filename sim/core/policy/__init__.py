"""Pluggable decisions of the scheduler (prefix-boundary policies)."""

from sim.core.policy.prefix import (
    PR48425Policy,
    PrefixLookup,
    PrefixPolicy,
    ReconciledPolicy,
    get_prefix_policy,
    prefix_policy_names,
    register_prefix_policy,
)

__all__ = [
    "PR48425Policy",
    "PrefixLookup",
    "PrefixPolicy",
    "ReconciledPolicy",
    "get_prefix_policy",
    "prefix_policy_names",
    "register_prefix_policy",
]
