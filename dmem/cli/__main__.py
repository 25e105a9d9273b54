"""``python -m dmem.cli``: the `dmem` command."""

from dmem.cli import main

if __name__ == "__main__":
    main()
