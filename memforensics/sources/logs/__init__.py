"""Kernel logs."""
