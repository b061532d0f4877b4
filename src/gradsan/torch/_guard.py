def guard(*a, **k):
    raise NotImplementedError
