"""Engine: the propose -> verify -> accept -> commit loop."""
