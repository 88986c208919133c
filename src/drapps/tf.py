"""drapps for TensorFlow users (the ``tf`` extra): a loader as a ``tf.data.Dataset``
(:func:`as_dataset`), and drapps' telemetry over a tf.data pipeline (:func:`watch`)."""

from drapps.integrations.tfdata import Watched, as_dataset, watch

__all__ = ["Watched", "as_dataset", "watch"]
