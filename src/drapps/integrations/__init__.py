"""Scale-out on the engines people already run: Ray actors as a worker pool, Redis as a shared
cache tier and a batch queue, and tf.data for TensorFlow users (each behind its extra)."""
