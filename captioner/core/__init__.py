"""The leaves every layer above uses: how a setting is declared (``settings``), devices, files, random state,
memory and console output."""
