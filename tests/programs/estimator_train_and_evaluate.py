"""An Estimator program in the style of the distributed TensorFlow examples' seed
(``mnist_train_and_evaluate.py``): ``tf.estimator.train_and_evaluate``, its role (chief,
worker, ps, evaluator) and the cluster read from TF_CONFIG by ``RunConfig``.

Estimator was removed in TensorFlow 2.16; this runs on a second interpreter with TensorFlow
2.15 and ``tensorflow-estimator`` (``scripts/setup_legacy_tf.sh``). The data are made here
(two separable classes), so nothing is downloaded. Usage: ``python estimator_train_and_evaluate.py
MODEL_DIR [MAX_STEPS]``.
"""

import json
import os
import sys

import numpy as np
import tensorflow as tf

FEATURES = 8


def examples(seed, count=4096):
    rng = np.random.RandomState(seed)
    x = rng.normal(size=(count, FEATURES)).astype("float32")
    y = (x[:, :4].sum(axis=1) > 0).astype("int32")
    return x, y


def input_fn(seed, repeat):
    def make():
        x, y = examples(seed)
        data = tf.data.Dataset.from_tensor_slices(({"x": x}, y)).batch(64)
        return data.repeat() if repeat else data

    return make


def main():
    model_dir = sys.argv[1]
    max_steps = int(sys.argv[2]) if len(sys.argv) > 2 else 400
    task = json.loads(os.environ.get("TF_CONFIG", "{}")).get("task", {})
    print(f"tensorflow {tf.__version__}, task {task}", flush=True)
    config = tf.estimator.RunConfig(
        model_dir=model_dir, save_checkpoints_steps=100, keep_checkpoint_max=3
    )
    columns = [tf.feature_column.numeric_column("x", shape=(FEATURES,))]
    estimator = tf.estimator.LinearClassifier(
        feature_columns=columns, config=config, optimizer="Adagrad"
    )
    seed = {"chief": 1, "worker": 2 + task.get("index", 0)}.get(task.get("type"), 1)
    train = tf.estimator.TrainSpec(input_fn=input_fn(seed, True), max_steps=max_steps)
    evaluate = tf.estimator.EvalSpec(
        input_fn=input_fn(99, False), steps=None, start_delay_secs=0, throttle_secs=1
    )
    tf.estimator.train_and_evaluate(estimator, train, evaluate)
    if task.get("type") in (None, "evaluator"):  # the evaluator scores the last checkpoint
        metrics = estimator.evaluate(input_fn(99, False), name="final")
        step, accuracy = metrics["global_step"], metrics["accuracy"]
        print(f"evaluated: global_step={step} accuracy={accuracy:.3f}", flush=True)


if __name__ == "__main__":
    main()
