"""Reading, checking, splitting and preprocessing data."""
