"""What runs inside each rank's engine process."""
