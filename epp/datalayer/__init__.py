"""datalayer"""
