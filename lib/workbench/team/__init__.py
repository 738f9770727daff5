"""Team mode: the shared MLflow server and copying runs between stores."""
