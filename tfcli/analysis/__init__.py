"""What analyses share, between the model (`tfcli/model/`) and the commands: the metric (`metric.py`: target,
foil, position), the inputs (`inputs.py`: a decoder's prompt, padded batches), the site names and kinds
(`names.py`), the residual algebra (`residual.py`: the final residual stream decomposed, the final norm folded
in), selections of layers and heads (`indices.py`), datasets (`dataset.py`: a `--dataset` file read and checked
line by line, and the spread over its items: the bootstrap, the ratio of means) and the task datasets `tfcli task`
writes (`tasks.py`: ioi, greater-than, induction, facts). Nothing here prints; nothing here imports a command."""
