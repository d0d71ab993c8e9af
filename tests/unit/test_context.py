"""The context stack behind ``with rm:`` and the open ``shard_map`` region (functional_mesh/_context.py).

Eager code sees its own thread's stack; compiled code reads the list, which holds what was pushed
while tracing and, on a shared stack, what was pushed eagerly too. The pushes "while tracing" are
made here the way ``push`` makes them under torch.compile: onto the list only.
"""

from __future__ import annotations

import threading

from functional_mesh._context import ContextStack


def in_thread(fn):
    out = []
    thread = threading.Thread(target=lambda: out.append(fn()))
    thread.start()
    thread.join()
    return out[0]


def test_an_unshared_stack_keeps_eager_values_to_eager_code_of_their_thread():
    stack = ContextStack("test_unshared", shared=False)
    assert stack.top(False) is None and stack.top(True) is None
    traced = stack.push("region")
    assert traced is False
    assert stack.top(False) == "region"
    assert stack.top(True) is None  # compiled code does not see an eager region
    assert in_thread(lambda: stack.top(False)) is None  # nor does another thread
    stack.pop("region", traced)
    assert stack.top(False) is None


def test_a_shared_stack_shows_eager_values_to_compiled_code_of_any_thread():
    stack = ContextStack("test_shared", shared=True)
    outer, inner = stack.push("outer"), stack.push("inner")
    assert stack.top(False) == "inner" and stack.top(True) == "inner"
    assert in_thread(lambda: (stack.top(False), stack.top(True))) == (None, "inner")
    stack.pop("inner", inner)
    assert stack.top(False) == "outer" and stack.top(True) == "outer"
    stack.pop("outer", outer)
    assert stack.top(False) is None and stack.top(True) is None


def test_eager_code_between_graphs_sees_a_value_pushed_while_tracing_on_an_unshared_stack_only():
    unshared, shared = ContextStack("test_u", shared=False), ContextStack("test_s", shared=True)
    for stack in (unshared, shared):
        stack._list.append("traced")  # what push does while torch.compile traces
    assert unshared.top(False) == "traced"  # the eager code between a compiled region's graphs
    assert shared.top(False) is None  # a with-rm mesh is entered eagerly, never while tracing
    for stack in (unshared, shared):
        assert stack.top(True) == "traced"
        stack.pop("traced", True)
        assert stack.top(True) is None


def test_threads_may_leave_a_shared_value_in_any_order():
    stack = ContextStack("test_order", shared=True)
    first = stack.push("a")
    second = in_thread(lambda: stack.push("a"))  # the same value, entered by another thread
    stack.pop("a", first)
    assert stack.top(True) == "a"  # the other thread's entry is still there
    in_thread(lambda: stack.pop("a", second))
    assert stack.top(True) is None
