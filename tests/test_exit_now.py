"""``exit_now``: a process that ends without Python's teardown still does what ``sys.exit`` promises:
its other threads finish, its ``atexit`` handlers run, its buffered output arrives, a spawned
child's queue delivers what it put, and ``run_main`` keeps its exit statuses."""

from __future__ import annotations

import multiprocessing as mp
import os
import subprocess
import sys
import textwrap

import pytest

from shardcore.processes import run_then_exit

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)


def test_threads_atexit_and_buffered_output_survive(tmp_path):
    proc = _run(f"""
        import atexit, sys, threading, time
        from shardcore.processes import exit_now
        def late():
            time.sleep(0.3)
            open({str(tmp_path / 'thread')!r}, 'w').write('done')
        threading.Thread(target=late).start()
        atexit.register(lambda: open({str(tmp_path / 'atexit')!r}, 'w').write('ran'))
        sys.stdout.write('no newline, still buffered')
        exit_now(3)
        """)
    assert proc.returncode == 3, proc.stderr
    assert proc.stdout == "no newline, still buffered"
    assert (tmp_path / "thread").read_text() == "done" and (tmp_path / "atexit").read_text() == "ran"


def _put_big(queue) -> None:
    queue.put(b"x" * (4 << 20))   # larger than a pipe's buffer: the feeder thread is still writing


def test_a_spawned_childs_queue_delivers_what_it_put_before_the_exit():
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    p = ctx.Process(target=run_then_exit, args=(_put_big, queue))
    p.start()
    try:
        assert len(queue.get(timeout=120)) == 4 << 20
    finally:
        p.join(60)
    assert p.exitcode == 0


def test_run_main_keeps_its_statuses_in_a_script_and_raises_in_a_caller():
    script = """
        import sys
        from shardcore.cli.common import run_main
        from shardcore.errors import ShardError
        def main(argv):
            kind = sys.argv[1]
            if kind == "bad":
                raise ShardError("the input is wrong")
            if kind == "text":
                return "a message"
            print("fine", end="")
            return 0 if kind == "ok" else 5
        run_main(main)
        """
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(script), "ok"], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)
    assert (proc.returncode, proc.stdout) == (0, "fine")
    for arg, code, err in (("five", 5, ""), ("bad", 2, "error: the input is wrong\n"), ("text", 1, "a message\n")):
        proc = subprocess.run([sys.executable, "-c", textwrap.dedent(script), arg], capture_output=True,
                              text=True, cwd=ROOT, timeout=120)
        assert (proc.returncode, proc.stderr) == (code, err), proc.stderr
    # called from other code (tests, entry points), with or without its arguments, run_main raises
    # SystemExit as sys.exit does: only a script's own main ends the process
    from shardcore.cli.common import run_main
    for argv in (["x"], None):
        with pytest.raises(SystemExit) as exc:
            run_main(lambda argv: 4, argv)
        assert exc.value.code == 4
