"""dispatchbench --keep-logs: where a child's lines go (bench.logs), and that children inherit it only when asked."""

import subprocess
import sys

from bench import logs
from bench.env import BenchEnv
from bench.procs import _role


def test_no_log_dir_keeps_no_file(tmp_path):
    assert logs.open_log({}, "producer", 1) is None
    assert logs.open_log({logs.LOG_DIR_ENV: ""}, "producer", 1) is None
    assert list(tmp_path.iterdir()) == []


def test_each_child_gets_a_file_of_its_own_even_in_the_same_second(tmp_path):
    env = {logs.LOG_DIR_ENV: str(tmp_path)}
    first = logs.open_log(env, "dispatcher-dispatch", 4242)
    second = logs.open_log(env, "dispatcher-dispatch", 4242)
    workers = logs.open_log(env, "pipeline-workers", binary=True)
    first.write("one\n")
    second.write("two\n")
    workers.write(b"job ran\n")
    for f in (first, second, workers):
        f.close()
    names = sorted(p.name for p in tmp_path.iterdir())
    assert len(names) == 3
    assert sum(name.endswith("-dispatcher-dispatch-4242.log") for name in names) == 2
    assert any(name.endswith("-pipeline-workers.log") for name in names)
    assert sorted(p.read_text() for p in tmp_path.iterdir()) == ["job ran\n", "one\n", "two\n"]


def test_runner_lines_are_stamped_line_by_line():
    stamped = logs.stamp("a\nb")
    lines = stamped.splitlines()
    assert [line[9:] for line in lines] == ["a", "b"]
    assert all(line[2] == ":" and line[5] == ":" for line in lines)
    assert logs.stamp("").count("\n") == 1


def _env(**kwargs) -> BenchEnv:
    env = BenchEnv(**kwargs)
    env.settings_dict = {"NAME": "productflow_bench", "HOST": "127.0.0.1"}  # what setup() fills in
    return env


def test_children_inherit_the_log_dir_only_when_logs_are_kept(tmp_path, monkeypatch):
    # A directory left in the bench's own environment by an earlier run is not passed on.
    monkeypatch.setenv(logs.LOG_DIR_ENV, "/somewhere/else")
    assert logs.LOG_DIR_ENV not in _env().child_env()
    assert _env(log_dir=tmp_path).child_env()[logs.LOG_DIR_ENV] == str(tmp_path)


def test_a_proc_log_is_named_for_its_module_and_role_not_its_json():
    assert _role(["bench.peer_procrastinate", "worker", '{"a": 1}']) == "peer_procrastinate-worker"
    assert _role(["bench.producer", '{"domain": "delivery"}']) == "producer"


def test_drain_keeps_a_bounded_tail_and_every_line_in_the_log(tmp_path):
    lines = logs.TAIL_LINES + 50
    child = subprocess.Popen(
        [sys.executable, "-c", f"import sys\nfor i in range({lines}): print(i, file=sys.stderr)"],
        stderr=subprocess.PIPE,
        text=True,
    )
    tail: list[str] = []
    log = logs.open_log({logs.LOG_DIR_ENV: str(tmp_path)}, "worker", child.pid)
    logs.drain(child.stderr, tail, log)
    assert child.wait(timeout=30) == 0
    assert tail == [f"{i}\n" for i in range(50, lines)]
    assert log.closed
    (kept,) = tmp_path.iterdir()
    assert kept.read_text().splitlines() == [str(i) for i in range(lines)]
    # Without a log directory only the tail is kept.
    tail.clear()
    logs.drain(iter(["a\n", "b\n"]), tail, None)
    assert tail == ["a\n", "b\n"]
