"""A flag-style distributed TensorFlow program, the way the low-level distributed guide writes
them: every process gets --ps_hosts, --worker_hosts, --job_name and --task_index; parameter
servers call server.join() and never return; worker 0 is the chief. It knows nothing of tfplan
(launched with recipe.command and {placeholders}, see docs/contract.md)."""

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import tensorflow as tf  # noqa: E402

v1 = tf.compat.v1
v1.disable_eager_execution()

parser = argparse.ArgumentParser()
parser.add_argument("--ps_hosts", required=True)
parser.add_argument("--worker_hosts", required=True)
parser.add_argument("--job_name", required=True)
parser.add_argument("--task_index", type=int, required=True)
parser.add_argument("--steps", type=int, default=200)
parser.add_argument("--logdir", default=None)
args = parser.parse_args()

cluster = tf.train.ClusterSpec(
    {"ps": args.ps_hosts.split(","), "worker": args.worker_hosts.split(",")}
)
server = tf.distribute.Server(cluster, job_name=args.job_name, task_index=args.task_index)
if args.job_name == "ps":
    print(f"ps/{args.task_index} joining", flush=True)
    server.join()  # never returns: the launcher has to end it

setter = v1.train.replica_device_setter(
    worker_device=f"/job:worker/task:{args.task_index}", cluster=cluster
)
with v1.device(setter):
    global_step = v1.train.get_or_create_global_step()
    weights = v1.get_variable("w", [10], initializer=v1.zeros_initializer())
    loss = tf.reduce_sum(tf.square(weights - 1.0))
    train = v1.train.GradientDescentOptimizer(0.01).minimize(loss, global_step=global_step)

hooks = [v1.train.StopAtStepHook(last_step=args.steps)]
with v1.train.MonitoredTrainingSession(
    master=server.target,
    is_chief=args.task_index == 0,
    checkpoint_dir=args.logdir,
    hooks=hooks,
) as sess:
    while not sess.should_stop():
        _, step = sess.run([train, global_step])
        if step % 50 == 0:
            print(f"step={step}", flush=True)
print(f"worker/{args.task_index} done", flush=True)
