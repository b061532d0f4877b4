def nansafe(*a, **k):
    raise NotImplementedError
