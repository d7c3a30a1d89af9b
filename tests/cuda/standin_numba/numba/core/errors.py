class NumbaError(Exception):
    pass


class NumbaPerformanceWarning(Warning):
    pass
