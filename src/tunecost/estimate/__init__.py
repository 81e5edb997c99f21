"""tunecost.estimate"""
