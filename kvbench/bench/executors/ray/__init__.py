"""The Ray executor: a driver placing units of a planned sweep on one worker actor per GPU."""
