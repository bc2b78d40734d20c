"""Test fixture plugin."""
