"""Phase 7, verify: the deploy ends by checking itself."""
