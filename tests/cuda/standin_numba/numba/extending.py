"""``numba.extending.overload`` as the stand-in needs it: registering works, nothing compiles."""


def overload(func, **options):
    return lambda typer: typer
