"""tunecost.evaluate"""
