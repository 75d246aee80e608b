"""Full-sequence call logs (SPEC §8, docs/calls.md): infer every call's parent by exact token
prefix, compute the deltas and chain hashes, report where the tokens drifted."""
