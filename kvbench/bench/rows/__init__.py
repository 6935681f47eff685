"""What a trial's row says: the one row builder every engine's output goes through, and the ``none``
reference every output is compared with."""
