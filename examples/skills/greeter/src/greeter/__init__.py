"""An example Python skill: installed into the kernel's venv as an editable."""


def greet(name: str) -> str:
    return f"Hello, {name}!"
