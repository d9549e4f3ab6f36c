"""Calibration to a user's own measured runs: read them (:mod:`.formats`), fit the scheduler's
host-side parameters and, where the runs support it, GPU-time scales per phase (:mod:`.fit`,
:mod:`.run`), and write / apply the profile (:mod:`.profile`). See docs/calibrate.md."""
