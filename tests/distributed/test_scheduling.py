from trak_dist.distributed._queue import TaskQueue
from trak_dist.pipeline import ShardTask


def tasks(model_id, n):
    return [ShardTask("train", model_id, 64 * i, 64 * (i + 1)) for i in range(n)]


def test_workers_spread_over_checkpoints_then_keep_theirs():
    q = TaskQueue(tasks(0, 3) + tasks(1, 3))
    a, b = q.pop_for(0), q.pop_for(1)
    assert (a.model_id, b.model_id) == (0, 1)  # the second worker goes where nobody is
    assert [q.pop_for(0).model_id for _ in range(2)] == [0, 0]  # affinity
    assert q.pop_for(0).model_id == 1  # its checkpoint is done: join the other one
    assert len(q) == 1 and q.pop_for(1).model_id == 1 and not q


def test_retries_go_first_and_every_task_comes_out_once():
    q = TaskQueue(tasks(0, 2) + tasks(2, 2))
    first = q.pop_for(0)
    q.push_front(first.retry())
    again = q.pop_for(0)
    assert (again.start, again.attempt) == (first.start, 1)
    rest = [q.pop_for(s % 2) for s in range(3)]
    assert sorted((t.model_id, t.start) for t in rest) == [(0, 64), (2, 0), (2, 64)]
