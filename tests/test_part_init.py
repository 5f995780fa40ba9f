"""Initial values for a row range of a variable without its whole (recipes/part_init.py), eager:
the numbers a split table's parts start from."""

from __future__ import annotations

import keras
import numpy as np

from recipes.part_init import rows_initializer


def test_a_variance_scaling_part_is_drawn_with_the_whole_variables_spread() -> None:
    """Glorot's limit is sqrt(6 / (fan_in + fan_out)) of the whole kernel: a part of a third of
    the rows must not get its own, wider, limit; He's deviation is the whole kernel's too."""
    full, part = (3000, 100), (1000, 100)
    glorot = rows_initializer(keras.initializers.GlorotUniform(seed=1), full, part, 0)
    assert glorot is not None
    values = np.asarray(glorot(part, dtype="float32"))
    limit = (6 / (3000 + 100)) ** 0.5
    assert values.shape == part
    assert 0.97 * limit < np.abs(values).max() <= limit, (np.abs(values).max(), limit)
    he = rows_initializer(keras.initializers.HeNormal(), full, part, 1)
    assert he is not None
    std = np.asarray(he(part, dtype="float32")).std()
    assert abs(std / (2 / 3000) ** 0.5 - 1) < 0.05, std  # the fan_in of the whole kernel


def test_each_part_gets_its_own_seed_and_a_users_seed_stays_reproducible() -> None:
    uniform = keras.initializers.RandomUniform(-0.05, 0.05, seed=7)
    first = [rows_initializer(uniform, (40, 3), (20, 3), i) for i in range(2)]
    again = [rows_initializer(uniform, (40, 3), (20, 3), i) for i in range(2)]
    values = [np.asarray(f((20, 3), dtype="float32")) for f in first if f is not None]
    repeat = [np.asarray(f((20, 3), dtype="float32")) for f in again if f is not None]
    assert len(values) == 2 and not np.allclose(values[0], values[1])
    np.testing.assert_array_equal(values[0], repeat[0])
    np.testing.assert_array_equal(values[1], repeat[1])
    unseeded = keras.initializers.RandomNormal()
    a, b = (rows_initializer(unseeded, (40, 3), (20, 3), i) for i in range(2))
    assert a is not None and b is not None
    assert not np.allclose(
        np.asarray(a((20, 3), dtype="float32")), np.asarray(b((20, 3), dtype="float32"))
    )


def test_an_initializer_without_a_row_wise_form_is_left_to_the_whole() -> None:
    assert rows_initializer(keras.initializers.Orthogonal(), (40, 40), (20, 40), 0) is None
    assert rows_initializer(keras.initializers.Identity(), (40, 40), (20, 40), 0) is None
    einsum = keras.initializers.VarianceScaling()
    einsum_config = einsum.get_config()
    if "input_axes" in einsum_config:  # Keras' EinsumDense fans: not counted here
        axes = keras.initializers.VarianceScaling(input_axes=(0,), output_axes=(1,))
        assert rows_initializer(axes, (40, 40), (20, 40), 0) is None
    ones = rows_initializer(keras.initializers.Constant(2.0), (4, 2), (2, 2), 1)
    assert ones is not None and np.all(np.asarray(ones((2, 2), dtype="float32")) == 2.0)
