"""The processor-side string fingerprint equals TensorFlow's to_hash_bucket_fast, every length."""

import numpy as np


def test_fingerprint_buckets_equal_tensorflow():
    import tensorflow as tf

    from processor.engine.string_hash import to_hash_bucket_fast

    rng = np.random.default_rng(0)
    values = [bytes(rng.integers(0, 256, n, dtype=np.uint8)) for n in [*range(0, 200), 255, 256, 257, 1000] * 2]
    values += ["héllo", "8625b742", b"\x00", b"\x00\x00abc\x00"]
    array = np.array(values, dtype=object).reshape(-1, 2)
    for buckets in (1, 7, 1000, 2**62):
        want = tf.strings.to_hash_bucket_fast(array, buckets).numpy()
        np.testing.assert_array_equal(to_hash_bucket_fast(array, buckets), want)


def test_one_width_fast_path_and_empty():
    import tensorflow as tf

    from processor.engine.string_hash import fingerprint64, to_hash_bucket_fast

    tokens = np.array([[b"%08x" % i for i in range(6)] for _ in range(4)], dtype=object)
    np.testing.assert_array_equal(to_hash_bucket_fast(tokens, 5000),
                                  tf.strings.to_hash_bucket_fast(tokens, 5000).numpy())
    assert fingerprint64(np.zeros((0, 3), dtype=object)).shape == (0, 3)


def test_native_fingerprint_buckets_equal_tensorflow():
    import tensorflow as tf

    from processor import native
    from processor.engine.string_hash import fingerprint, hash_buckets

    if native.MODULE is None:
        import pytest
        pytest.skip("processor._native is not built")
    rng = np.random.default_rng(1)
    values = [bytes(rng.integers(0, 256, n, dtype=np.uint8)) for n in [*range(0, 300), 511, 4096]]
    values += ["héllo", "8625b742", b"\x00", b"\x00\x00abc\x00"]
    array = np.array(values, dtype=object).reshape(-1, 3)
    hashed = native.MODULE.fingerprint64(array)
    assert hashed is not None and hashed.shape == array.shape
    np.testing.assert_array_equal(fingerprint(array), hashed)
    for buckets in (1, 7, 1000, 2**62):
        want = tf.strings.to_hash_bucket_fast(array, buckets).numpy()
        np.testing.assert_array_equal((hashed % np.uint64(buckets)).astype(np.int64), want)
        got = hash_buckets(array, buckets)  # hash and modulo in one native pass
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)
