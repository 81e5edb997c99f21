"""tunecost.report"""
