"""placeholder"""
ZOO = {}
