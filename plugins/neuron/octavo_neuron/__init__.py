"""The AWS Trainium/Inferentia platform for Octavo (NKI kernels)."""
