"""tunecost.simulate"""
