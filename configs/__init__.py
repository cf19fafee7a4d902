# Bundled model configs, shipped inside the wheel as the package `tfcli.configs`.
