"""tunecost.profile"""
