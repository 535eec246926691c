"""What is checked and at which inputs: loading targets, the input language, inference, cases."""
