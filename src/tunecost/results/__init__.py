"""tunecost.results"""
