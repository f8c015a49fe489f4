"""flowcontrol"""
