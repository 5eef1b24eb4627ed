"""bench.reqcost drives a real in-process server through each workload without errors, and folds a
py-spy record into the request's layers (the client and fdatasync apart)."""

import pytest

from bench import reqcost


@pytest.mark.parametrize("workload", sorted(reqcost.WORKLOADS))
def test_each_workload_runs_and_reports(tmp_path, capsys, workload):
    reqcost.main(["--workload", workload, "--requests", "40", "--warmup", "8", "--connections", "2",
                  "--data-parent", str(tmp_path)])
    line = capsys.readouterr().out
    assert f"workload={workload} ops=1 connections=2" in line and "requests=40" in line, line
    assert list(tmp_path.iterdir()) == []  # its data dir is gone


def test_auth_runs_with_a_token(tmp_path, capsys):
    reqcost.main(["--auth", "--requests", "10", "--warmup", "2", "--data-parent", str(tmp_path)])
    assert "auth=on" in capsys.readouterr().out


def test_fold_charges_each_sample_to_its_layer(tmp_path):
    loop = "thread (1): MainThread;unrolled_run (trio/_core/_run.py:1)"
    raw = tmp_path / "record.txt"
    raw.write_text("\n".join([
        f"{loop};_serve (queen/http/connection.py:1);parse_simple_request (queen/http/wire.py:1) 3",
        f"{loop};run (queen/wal/writer.py:1);Disk.fsync (queen/wal/disk.py:1) 5",
        f"{loop};loop (bench/reqcost.py:1);_Client.call (bench/reqcost.py:2) 2",
        f"{loop} 1",
        "thread (2): queen-wal-disk;DiskThread._work (queen/wal/disk_thread.py:1) 9",
    ]) + "\n")
    layers = {layer: (count, share) for layer, count, share in reqcost.fold(str(raw))}
    assert layers["HTTP parse"] == (3, 0.75)
    assert layers["trio scheduling (run loop, task switches)"] == (1, 0.25)
    assert layers[reqcost.FSYNC] == (5, 0.0) and layers["(client, not counted)"] == (2, 0.0)
    assert sum(count for count, _ in layers.values()) == 11  # the other thread is left out
