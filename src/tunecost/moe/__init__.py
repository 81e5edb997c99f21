"""tunecost.moe"""
