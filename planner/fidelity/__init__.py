"""Cost-model fidelity: published measured runs, their comparison with predictions, calibration."""
