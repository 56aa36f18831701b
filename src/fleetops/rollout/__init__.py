"""The rollout: state, locks, lease, audit, preflight, gate and the engine that runs batch by batch."""
