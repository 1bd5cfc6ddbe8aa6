"""The stress and fault probe (tests/stress.py), short: every design, policy and overlap setting, with aborts,
injected forward faults and preemption storms, every answer against step01's. `make stress` runs it long."""
from __future__ import annotations

from tests import stress


def test_every_engine_survives_the_probe():
    total = stress.run(requests_per_combo=40, seed=1)
    assert not total.failures, "\n".join(total.failures[:10])
    assert total.combos == 38, "5 designs x the policies each accepts x overlap off/on, the bridge with a host tier; " \
        "and each design (the bridge with and without its tier) decoding speculatively"
    assert total.finished and total.aborted and total.faults and total.preemptions, f"the probe was too gentle: {total}"
    assert total.drafts > total.accepted > 0, f"speculation was meant to keep some drafts and reject others: {total}"
    assert total.cached_tokens and total.host_loads, f"the caches were meant to hit, the host tier to load: {total}"


def test_a_seed_gives_the_same_run():
    runs = [stress.run(requests_per_combo=20, seed=7, only="bridge/lpm/overlap host") for _ in range(2)]
    assert runs[0] == runs[1] and runs[0].combos == 1


def test_the_command_line_says_what_it_ran(capsys):
    assert stress.main(["--requests", "5", "--seed", "2", "--only", "radix/fcfs/sync"]) == 0
    assert "1 combinations, seed 2: 5 requests" in capsys.readouterr().out
