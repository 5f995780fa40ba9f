"""What a chief's session recovers from (recipes/runtime.py): a step's error that a ps's loss
caused, whatever type TensorFlow gave it, makes MonitoredSession start a new session; any other
error still ends the program."""

from __future__ import annotations

from typing import Any

import pytest
import tensorflow as tf

from recipes.runtime import PeerLossIsUnavailable, lost_peer

v1 = tf.compat.v1

# A step's error as TensorFlow raised it on the Slurm test bed after a ps restarted: typed after
# the worker's own cancelled receive, the ps's ABORTED inside.
CANCELLED_BY_RESTART = (
    "Graph execution error:\n\n=====================\nCANCELLED: From /job:worker/replica:0/"
    "task:0:\nRecvFromRemoteAsync is cancelled.\n\t [[{{node global_step/cond/switch_pred/_2_S25}}]]"
    "\nABORTED: From /job:ps/replica:0/task:0:\nSession handle is not found: 0bb53715de399899. "
    'Possibly this worker ("/job:ps/replica:0/task:0") just restarted.\n====================='
)


def test_a_cancelled_step_is_a_lost_peer_only_when_a_ps_caused_it() -> None:
    assert lost_peer(tf.errors.CancelledError(None, None, CANCELLED_BY_RESTART))
    assert not lost_peer(tf.errors.CancelledError(None, None, "Run call was cancelled"))
    assert lost_peer(tf.errors.UnknownError(None, None, "Connection reset by peer"))
    assert not lost_peer(tf.errors.UnknownError(None, None, "a bug in the model"))


class _FailsOnce:
    """A raw session whose first run fails with ``error``."""

    def __init__(self, sess: Any, error: Exception) -> None:
        self._sess, self._error = sess, error

    def run(self, *args: Any, **kwargs: Any) -> Any:
        error, self._error = self._error, None
        if error is not None:
            raise error
        return self._sess.run(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sess, name)


class _Creator(v1.train.SessionCreator):  # type: ignore[name-defined]
    def __init__(self, error: Exception) -> None:
        self.error: Exception | None = error
        self.created = 0

    def create_session(self) -> Any:
        self.created += 1
        sess = v1.Session()
        sess.run(v1.global_variables_initializer())
        error, self.error = self.error, None
        return PeerLossIsUnavailable(_FailsOnce(sess, error) if error else sess)


def _step_after(error: Exception) -> tuple[int, int]:
    """The value a step returns after ``error`` on the first try, and the sessions created."""
    with tf.Graph().as_default():
        step = v1.train.get_or_create_global_step()
        train = v1.assign_add(step, 1)
        creator = _Creator(error)
        with v1.train.MonitoredSession(session_creator=creator) as sess:
            return int(sess.run(train)), creator.created


def test_a_step_cancelled_by_a_restarted_ps_starts_a_new_session() -> None:
    assert _step_after(tf.errors.CancelledError(None, None, CANCELLED_BY_RESTART)) == (1, 2)


def test_any_other_cancelled_step_still_ends_the_program() -> None:
    with pytest.raises(tf.errors.CancelledError):
        _step_after(tf.errors.CancelledError(None, None, "Run call was cancelled"))
