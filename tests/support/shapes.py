"""Tables shaped like the public CSVs a new user tries first (generated here: nothing is downloaded): taxi trips
(datetimes, missing values, a decimal fare), cars (a name per row, '?' for missing horsepower), restaurant tips."""

from __future__ import annotations

import numpy as np
import pandas as pd


def taxis(n: int = 6000, seed: int = 0) -> pd.DataFrame:
    """Trips with a fare in quarters of a dollar: about 3% distinct values, numbers with fractions."""
    rng = np.random.default_rng(seed)
    pickup = pd.Timestamp("2019-03-01") + pd.to_timedelta(rng.integers(0, 31 * 24 * 3600, n), unit="s")
    distance = np.round(rng.gamma(2.0, 1.5, n), 2)
    minutes = np.maximum(2, distance * 4 + rng.normal(0, 3, n))
    fare = np.round((2.5 + 2.5 * distance + 0.3 * minutes) * 4) / 4
    payment = rng.choice(["credit card", "cash", None], n, p=[0.7, 0.28, 0.02])
    return pd.DataFrame(
        {
            "pickup": pickup.strftime("%Y-%m-%d %H:%M:%S"),
            "dropoff": (pickup + pd.to_timedelta(minutes, unit="m")).strftime("%Y-%m-%d %H:%M:%S"),
            "passengers": rng.choice([1, 1, 1, 2, 3, 5], n),
            "distance": distance,
            "color": rng.choice(["yellow", "green"], n, p=[0.85, 0.15]),
            "payment": payment,
            "borough": rng.choice(["Manhattan", "Queens", "Brooklyn", "Bronx"], n, p=[0.7, 0.15, 0.1, 0.05]),
            "fare": fare,
        }
    )


def cars(n: int = 398, seed: int = 0) -> pd.DataFrame:
    """Cars: a name per row (an id, really), integer columns, '?' where horsepower is unknown, a decimal mpg."""
    rng = np.random.default_rng(seed)
    cylinders = rng.choice([4, 6, 8], n, p=[0.5, 0.25, 0.25])
    weight = (1500 + cylinders * 350 + rng.normal(0, 250, n)).astype(int)
    horsepower = (40 + cylinders * 15 + rng.normal(0, 12, n)).astype(int).astype(object)
    horsepower[rng.choice(n, 6, replace=False)] = "?"
    makes = ["ford", "chevrolet", "toyota", "datsun", "vw", "fiat", "honda", "amc"]
    return pd.DataFrame(
        {
            "name": [f"{rng.choice(makes)} model {i}" for i in range(n)],
            "cylinders": cylinders,
            "horsepower": horsepower,
            "weight": weight,
            "model_year": rng.integers(70, 83, n),
            "origin": rng.choice(["usa", "europe", "japan"], n, p=[0.6, 0.2, 0.2]),
            "mpg": np.round(55 - weight / 110 + rng.normal(0, 2.5, n), 1),
        }
    )


def tips(n: int = 244, seed: int = 0) -> pd.DataFrame:
    """Restaurant bills: a decimal tip, Yes/No smokers, days and meal times, party sizes 1-6."""
    rng = np.random.default_rng(seed)
    day = rng.choice(["Thur", "Fri", "Sat", "Sun"], n, p=[0.25, 0.1, 0.35, 0.3])
    size = rng.choice([1, 2, 2, 2, 3, 4, 4, 5, 6], n)
    bill = np.round(size * rng.gamma(4.0, 1.6, n) + 3, 2)
    weekend = np.isin(day, ["Sat", "Sun"])
    return pd.DataFrame(
        {
            "total_bill": bill,
            "tip": np.round(np.maximum(1.0, bill * rng.normal(0.16, 0.04, n)), 2),
            "sex": rng.choice(["Female", "Male"], n),
            "smoker": rng.choice(["Yes", "No"], n, p=[0.38, 0.62]),
            "day": day,
            "time": np.where(weekend | (rng.random(n) < 0.3), "Dinner", "Lunch"),
            "size": size,
        }
    )
