"""What analyses share, between the model (`tfcli/model/`) and the commands: the metric (`metric.py`: target,
foil, position), the inputs (`inputs.py`: a decoder's prompt, padded batches), the site names and kinds
(`names.py`), the residual algebra (`residual.py`: the final residual stream decomposed, the final norm folded
in) and selections of layers and heads (`indices.py`). Nothing here prints; nothing here imports a command."""
