"""Configuration: the DISPATCH settings and the rules between them, the measured tuning constants, failpoints."""
