"""The Spark backend: the plan's tasks on the executors of one Spark application.

- :mod:`.options`     ``cluster.options`` of ``cluster=spark``, checked (pure)
- :mod:`.driver_app`  the Spark application: one long Spark task per executor, a tfplan agent
- :mod:`.agent`       the agent inside an executor: runs tfplan's sh scripts on its host
- :mod:`.transport`   the process backend's transport to an agent (TCP, with a token)
- :mod:`.backend`     :class:`SparkBackend`: the application's life; the rest is the process
  backend's
"""

from tfplan.backends.spark.backend import SparkBackend

__all__ = ["SparkBackend"]
