"""`tfcli lens`: the tuned lens fitted on a corpus (`lens fit`) and evaluated against the logit lens (`lens eval`)."""
